// OamAsyncActions.h - Blueprint async nodes: NPC Respond, NPC Decide, Save / Restore NPC Transcript.
// Each node has exec pins per outcome and the result as data; the game thread never waits.
#pragma once

#include "CoreMinimal.h"
#include "Kismet/BlueprintAsyncActionBase.h"

#include "OamBridgeTypes.h"

#include "OamAsyncActions.generated.h"

class UOamNpcComponent;

DECLARE_DYNAMIC_MULTICAST_DELEGATE_TwoParams(FOamTurnPinSignature, const FOamTurnResult&, Result, const FOamError&, Error);
DECLARE_DYNAMIC_MULTICAST_DELEGATE_ThreeParams(FOamDecisionPinSignature, const FOamDecision&, Decision, const FOamTurnResult&, Result, const FOamError&, Error);
DECLARE_DYNAMIC_MULTICAST_DELEGATE_TwoParams(FOamTranscriptPinSignature, const FString&, Json, const FOamError&, Error);

/** NPC Respond: OnTextDelta for each piece of text (Result.Delta), then Completed (Result.Text) or Failed (Error). */
UCLASS()
class OAMBRIDGE_API UOamRespondAction : public UBlueprintAsyncActionBase
{
	GENERATED_BODY()

public:
	UFUNCTION(BlueprintCallable, Category = "OAM Bridge", meta = (BlueprintInternalUseOnly = "true", DisplayName = "NPC Respond", AdvancedDisplay = "Speaker"))
	static UOamRespondAction* NpcRespond(UOamNpcComponent* Npc, const FString& Prompt, const FString& Speaker);

	UPROPERTY(BlueprintAssignable)
	FOamTurnPinSignature OnTextDelta;

	UPROPERTY(BlueprintAssignable)
	FOamTurnPinSignature Completed;

	UPROPERTY(BlueprintAssignable)
	FOamTurnPinSignature Failed;

	virtual void Activate() override;

private:
	TWeakObjectPtr<UOamNpcComponent> Npc;
	FString Prompt;
	FString Speaker;
};

/** NPC Decide: Decided (Decision.Choice is one of Options) or Failed. */
UCLASS()
class OAMBRIDGE_API UOamDecideAction : public UBlueprintAsyncActionBase
{
	GENERATED_BODY()

public:
	UFUNCTION(BlueprintCallable, Category = "OAM Bridge", meta = (BlueprintInternalUseOnly = "true", DisplayName = "NPC Decide", AdvancedDisplay = "bReasoning"))
	static UOamDecideAction* NpcDecide(UOamNpcComponent* Npc, const FString& Situation, const TArray<FOamDecisionOption>& Options, bool bReasoning = true);

	UPROPERTY(BlueprintAssignable)
	FOamDecisionPinSignature Decided;

	UPROPERTY(BlueprintAssignable)
	FOamDecisionPinSignature Failed;

	virtual void Activate() override;

private:
	TWeakObjectPtr<UOamNpcComponent> Npc;
	FString Situation;
	TArray<FOamDecisionOption> Options;
	bool bReasoning = true;
};

/** Save NPC Transcript: Saved (Json: the save for the save game) or Failed (Error; never an empty save). */
UCLASS()
class OAMBRIDGE_API UOamSaveTranscriptAction : public UBlueprintAsyncActionBase
{
	GENERATED_BODY()

public:
	UFUNCTION(BlueprintCallable, Category = "OAM Bridge", meta = (BlueprintInternalUseOnly = "true", DisplayName = "Save NPC Transcript", WorldContext = "WorldContextObject"))
	static UOamSaveTranscriptAction* SaveNpcTranscript(UObject* WorldContextObject, const FString& NpcId);

	UPROPERTY(BlueprintAssignable)
	FOamTranscriptPinSignature Saved;

	UPROPERTY(BlueprintAssignable)
	FOamTranscriptPinSignature Failed;

	virtual void Activate() override;

private:
	TWeakObjectPtr<UObject> WorldContext;
	FString NpcId;
};

/** Restore NPC Transcript: Restored (Json: the restored NPC's id) or Failed. NpcId empty keeps the saved id. */
UCLASS()
class OAMBRIDGE_API UOamRestoreTranscriptAction : public UBlueprintAsyncActionBase
{
	GENERATED_BODY()

public:
	UFUNCTION(BlueprintCallable, Category = "OAM Bridge", meta = (BlueprintInternalUseOnly = "true", DisplayName = "Restore NPC Transcript", WorldContext = "WorldContextObject", AdvancedDisplay = "NpcId"))
	static UOamRestoreTranscriptAction* RestoreNpcTranscript(UObject* WorldContextObject, const FString& SaveJson, const FString& NpcId);

	UPROPERTY(BlueprintAssignable)
	FOamTranscriptPinSignature Restored;

	UPROPERTY(BlueprintAssignable)
	FOamTranscriptPinSignature Failed;

	virtual void Activate() override;

private:
	TWeakObjectPtr<UObject> WorldContext;
	FString SaveJson;
	FString NpcId;
};
