// OamAsyncActions.cpp
#include "OamAsyncActions.h"

#include "Engine/GameInstance.h"
#include "Engine/World.h"

#include "OamBridgeSubsystem.h"
#include "OamJson.h"
#include "OamNpcComponent.h"

static UOamBridgeSubsystem* BridgeOf(const UObject* WorldContextObject)
{
	const UWorld* World = WorldContextObject ? WorldContextObject->GetWorld() : nullptr;
	UGameInstance* GameInstance = World ? World->GetGameInstance() : nullptr;
	return GameInstance ? GameInstance->GetSubsystem<UOamBridgeSubsystem>() : nullptr;
}

static FOamError NoNpc()
{
	FOamError E;
	E.Code = TEXT("no_npc");
	E.Message = TEXT("the NPC component is gone");
	return E;
}

UOamRespondAction* UOamRespondAction::NpcRespond(UOamNpcComponent* Npc, const FString& Prompt, const FString& Speaker)
{
	UOamRespondAction* Action = NewObject<UOamRespondAction>();
	Action->Npc = Npc;
	Action->Prompt = Prompt;
	Action->Speaker = Speaker;
	Action->RegisterWithGameInstance(Npc);  // kept alive until SetReadyToDestroy
	return Action;
}

void UOamRespondAction::Activate()
{
	UOamNpcComponent* Component = Npc.Get();
	if (!Component)
	{
		Failed.Broadcast(FOamTurnResult(), NoNpc());
		SetReadyToDestroy();
		return;
	}
	TWeakObjectPtr<UOamRespondAction> WeakThis(this);
	UOamNpcComponent::FTurnHandlers Handlers;
	Handlers.OnDelta = [WeakThis](const FOamTurnResult& Partial)
	{
		if (UOamRespondAction* Self = WeakThis.Get())
		{
			Self->OnTextDelta.Broadcast(Partial, FOamError());
		}
	};
	Handlers.OnDone = [WeakThis](bool bSuccess, const FOamTurnResult& Result, const FOamDecision&, const FOamError& Error)
	{
		if (UOamRespondAction* Self = WeakThis.Get())
		{
			(bSuccess ? Self->Completed : Self->Failed).Broadcast(Result, Error);
			Self->SetReadyToDestroy();
		}
	};
	Component->StartRespond(Prompt, Speaker, MoveTemp(Handlers));
}

UOamDecideAction* UOamDecideAction::NpcDecide(UOamNpcComponent* Npc, const FString& Situation, const TArray<FOamDecisionOption>& Options, bool bReasoning)
{
	UOamDecideAction* Action = NewObject<UOamDecideAction>();
	Action->Npc = Npc;
	Action->Situation = Situation;
	Action->Options = Options;
	Action->bReasoning = bReasoning;
	Action->RegisterWithGameInstance(Npc);
	return Action;
}

void UOamDecideAction::Activate()
{
	UOamNpcComponent* Component = Npc.Get();
	if (!Component)
	{
		Failed.Broadcast(FOamDecision(), FOamTurnResult(), NoNpc());
		SetReadyToDestroy();
		return;
	}
	TWeakObjectPtr<UOamDecideAction> WeakThis(this);
	UOamNpcComponent::FTurnHandlers Handlers;
	Handlers.OnDone = [WeakThis](bool bSuccess, const FOamTurnResult& Result, const FOamDecision& Decision, const FOamError& Error)
	{
		if (UOamDecideAction* Self = WeakThis.Get())
		{
			(bSuccess ? Self->Decided : Self->Failed).Broadcast(Decision, Result, Error);
			Self->SetReadyToDestroy();
		}
	};
	Component->StartDecide(Situation, Options, bReasoning, false, MoveTemp(Handlers));
}

UOamSaveTranscriptAction* UOamSaveTranscriptAction::SaveNpcTranscript(UObject* WorldContextObject, const FString& NpcId)
{
	UOamSaveTranscriptAction* Action = NewObject<UOamSaveTranscriptAction>();
	Action->WorldContext = WorldContextObject;
	Action->NpcId = NpcId;
	Action->RegisterWithGameInstance(WorldContextObject);
	return Action;
}

// Done for the save / restore nodes: the outcome pin, then the node may go.
template <class TAction>
static UOamBridgeSubsystem::FJsonDone TranscriptDone(TAction* Action, FOamTranscriptPinSignature TAction::*Success)
{
	TWeakObjectPtr<TAction> WeakAction(Action);
	return [WeakAction, Success](bool bSuccess, const FString& Json, const FOamError& Error)
	{
		if (TAction* Self = WeakAction.Get())
		{
			(bSuccess ? Self->*Success : Self->Failed).Broadcast(Json, Error);
			Self->SetReadyToDestroy();
		}
	};
}

void UOamSaveTranscriptAction::Activate()
{
	UOamBridgeSubsystem* Bridge = BridgeOf(WorldContext.Get());
	if (!Bridge)
	{
		Failed.Broadcast(FString(), OamJson::MakeError(TEXT("no_bridge"), TEXT("no OamBridgeSubsystem for this world")));
		SetReadyToDestroy();
		return;
	}
	Bridge->SaveTranscriptThen(NpcId, TranscriptDone(this, &UOamSaveTranscriptAction::Saved));
}

UOamRestoreTranscriptAction* UOamRestoreTranscriptAction::RestoreNpcTranscript(UObject* WorldContextObject, const FString& SaveJson, const FString& NpcId)
{
	UOamRestoreTranscriptAction* Action = NewObject<UOamRestoreTranscriptAction>();
	Action->WorldContext = WorldContextObject;
	Action->SaveJson = SaveJson;
	Action->NpcId = NpcId;
	Action->RegisterWithGameInstance(WorldContextObject);
	return Action;
}

void UOamRestoreTranscriptAction::Activate()
{
	UOamBridgeSubsystem* Bridge = BridgeOf(WorldContext.Get());
	if (!Bridge)
	{
		Failed.Broadcast(FString(), OamJson::MakeError(TEXT("no_bridge"), TEXT("no OamBridgeSubsystem for this world")));
		SetReadyToDestroy();
		return;
	}
	Bridge->RestoreTranscriptThen(SaveJson, NpcId, TranscriptDone(this, &UOamRestoreTranscriptAction::Restored));
}
